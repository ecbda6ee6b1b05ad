"""PySpark jobs over the event log: incremental Parquet export, hourly
statistics, binder rebuilds.  Needs the optional ``pipeline`` extra (PySpark)
and Java; see docs/pipeline.md.  Only modules that run a job import pyspark.
"""
