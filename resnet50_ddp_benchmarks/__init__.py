"""What the analysis tools share (report.py, compare.py, scaling_model.py, tools/) and the benchmark scripts' options
that need more than torch: imported by name once `pip install -e .` has installed the repository."""
