"""The dashboard at `/ui`: static files shipped in the package (no build step, nothing from a CDN) and the JSON
views they read, scoped to the caller's tenant like every inspection route."""
