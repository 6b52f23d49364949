"""Near-memory embedding engines (lookup-reduce, update; FP32). Not built yet: issue 4."""
