"""Experiment configs: each file has get_config(arg=None) -> ml_collections.ConfigDict."""
