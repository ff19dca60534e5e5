"""Models: the tiny locally built model for tests, and the warm-started ``arith`` base model."""
