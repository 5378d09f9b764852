"""Containers, repository-only: the Docker engine (``engine``), base images made from Debian packages (``base``), the
streaminfer images (``images``), the local ``apache/kafka`` image and its testcontainers broker (``kafka``), the
Deployment translated into ``docker run`` (``pod``) and the CPU image end to end (``serve``); ``python -m
harness.docker`` is the command line (``cli``). docs/containers.md is the guide.
"""
