"""Helpers shared by the test tiers: host trees, fakes, servers, registries, the CLI."""
