"""The development and test harness: the local broker, the demo, the fault injection, the benchmark, the soak,
the GPU check and the network impairment tools. Repository only: never shipped in the wheel or the images; run as
``python -m harness.X`` from the repository root, or through make and scripts/."""
