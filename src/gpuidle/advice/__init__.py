"""From findings to recommendations, and the standard formulas they use."""
