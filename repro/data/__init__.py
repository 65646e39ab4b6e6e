"""Datasets: loaders for DAPO-Math-17K / AIME-2024 layouts and the synthetic tiny-math generator."""
