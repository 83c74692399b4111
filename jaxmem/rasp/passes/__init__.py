"""The compiler's passes, one per module, each named ``source_to_target`` (tracr's ``compiler/``,
re-derived for hard attention). :func:`jaxmem.rasp.compile` runs them in this order:

1. :mod:`~jaxmem.rasp.passes.rasp_to_normal_form` — the program in a compilable normal form;
2. :mod:`~jaxmem.rasp.passes.rasp_to_graph` — its graph, and the encodings checked;
3. :mod:`~jaxmem.rasp.passes.graph_to_value_sets` — the value set of every SOp that needs one, and
   which SOps may be None. Value sets are computed on demand: their ``ValueSets`` object is made
   first, and pass 1 already asks it (a width over a sort key, or over an Or, is split only where
   the values show it can be);
4. :mod:`~jaxmem.rasp.passes.graph_to_schedule` — the layer of every op;
5. :mod:`~jaxmem.rasp.passes.schedule_to_craft` — the residual space and every head and MLP as numpy
   arrays (the blocks are :mod:`jaxmem.rasp.craft`'s), the size checked before any is built;
6. :mod:`~jaxmem.rasp.passes.craft_to_model` — the runnable :class:`~jaxmem.rasp.model.CompiledModel`.

:mod:`~jaxmem.rasp.passes.values` holds what every pass needs of RASP values. Each pass raises
:class:`ValueError` naming the offending node (``'<label>'``).
"""
