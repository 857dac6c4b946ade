"""Theano's `theano.sandbox` import paths (rng_mrg)."""
