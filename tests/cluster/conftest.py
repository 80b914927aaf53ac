"""The `env` fixture (stand-in API server, host root, kubeconfig) for every test here."""

from cluster.test_protocol import env  # noqa: F401
