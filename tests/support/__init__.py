"""What several test modules share (a test module never imports another): references, builders, clients, paths."""
