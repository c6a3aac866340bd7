"""Studies: a sweep file → trials (spec), the Ray driver (sweep, trial, status), the dry run's cost
estimates (cost) and the rliable report of finished runs (results, report, figures)."""
