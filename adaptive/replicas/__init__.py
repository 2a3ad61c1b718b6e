"""Ray replicas: one engine per actor, the cluster that routes requests across them,
and the local Ray session the CLI and the tests share."""
