"""Plug points for other ecosystems (Dask's comm backend); they use tensorwire's public API."""
