"""Serving many requests at once: paged KV blocks, prefix caching, scheduling (part IV)."""
