"""AIME competition-math environment and its Minerva-style answer scoring."""
