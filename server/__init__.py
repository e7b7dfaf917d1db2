# Only reachable as gpuscope.server: the repository root is the gpuscope package, and a bare `import server`
# (possible when Python runs from the checkout) would load a second, unrelated copy of these modules.
if __name__ != "gpuscope.server":
    raise ImportError("import gpuscope.server, not server: install the package (make install) and use its namespaced name")
