"""The rewrite machinery: node rewrites, graph rewrites and the pass database."""
