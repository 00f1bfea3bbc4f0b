"""The Table 1 experiment: settings, data preparation, Moses system training, tuning runs and the report."""
