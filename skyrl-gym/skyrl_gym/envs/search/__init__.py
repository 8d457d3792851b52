"""Retrieval-augmented question answering environment and its exact-match scoring."""
