"""Operations: metrics, health checks, logs, traces, progress."""
