"""The dnf source: NVIDIA's packages from the RHEL family's repos, DKMS for the target kernel."""

# Nothing here is for other rooms: the source is registered in `sources.SOURCES`.
__all__: list[str] = []
