"""File names inside a profile folder (``<gpu>/<model>/tp<N>/``), apart from the table code that reads them, so
that loading a fitted model imports no table library."""

MEASUREMENTS_CSV = "measurements.csv"
PROFILE_JSON, LINEAR_JSON, PIECEWISE_JSON = "profile.json", "infermax_linear.json", "infermax_piecewise.json"
