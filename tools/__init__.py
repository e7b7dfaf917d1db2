# Only reachable as gpuscope.tools: the repository root is the gpuscope package, and a bare `import tools`
# (possible when Python runs from the checkout) would load a second, unrelated copy of these modules.
if __name__ != "gpuscope.tools":
    raise ImportError("import gpuscope.tools, not tools: install the package (make install) and use its namespaced name")
