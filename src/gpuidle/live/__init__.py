"""Live producers of model objects: device sampling (monitor), the command wrapper, the exporter."""
