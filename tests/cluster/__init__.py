"""Tests of installer/cluster against a stand-in Kubernetes API server on 127.0.0.1."""
