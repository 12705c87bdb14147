"""Commands outside the DVC graph: export, pictures, photo and video inference, benchmarks, leaderboard."""
