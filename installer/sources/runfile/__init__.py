"""The runfile source: NVIDIA's .run fetched, verified, extracted and built on the node."""
