"""Bridges to other packages; each is imported on demand, never at package import."""
