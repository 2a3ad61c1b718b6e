"""The OpenAI-compatible HTTP front on Ray Serve: the app, its router to the replicas,
the request and response protocol, streaming, and the loopback used without Serve."""
