"""Reports: pure functions of rows (tables now; HTML and plots to come)."""
