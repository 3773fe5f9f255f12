"""Model families: one module per family of Hugging Face `model_type`s (see registry.py). A module registers its
`Family` objects when the registry first imports it; adding a family is adding a module here, plus its tests."""
