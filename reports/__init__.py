"""Presentation of results: nothing here measures or re-runs anything; it reads result documents
(``results.json``) and renders them. ``terminal`` renders the end-of-run summary table."""
