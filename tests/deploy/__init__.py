"""Tests of the images, the DaemonSet manifests and their contract with the installer."""
