"""Reports: pure functions of rows, then files.

``ratio`` (the one ratio rule) <- ``tables`` (ratio tables), ``efficiency`` (efficiency
lengths), ``paper``, ``quality`` (tables of text, :class:`~attnbench.report.grid.Grid`),
``plots`` and ``quality_plots`` (figures) <- ``sections`` (what a report holds) <- the
formats (``text``: Markdown, LaTeX, CSV; ``html``; ``terminal``) <- ``files`` (build,
render, write with ``replace``)."""
