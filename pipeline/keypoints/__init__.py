"""Keypoint maths: the schema and its flip, crop geometry, the network's input contract, scores, calibration, drawing."""
