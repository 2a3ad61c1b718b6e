"""Exact offline replay: the trace format and its readers, the simulator that replays a
recorded trace under any policy and cost model, and the runner that batches it by concurrency."""
