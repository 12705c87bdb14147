"""Foundation: errors, atomic writes, params, devices, fault injection."""
