"""The dnf source: NVIDIA's packages from the RHEL family's repos, DKMS for the target kernel."""
