"""Tools over a finished tree: surgical removal and verification."""
