"""streaminfer producer tools: produce requests, read results, run the demo, generate poison records."""
