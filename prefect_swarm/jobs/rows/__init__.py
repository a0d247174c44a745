"""Where rows come from and go to: the input (``input``), the output's formats and dataset folders
(``output``), local and object-store locations (``storage``), and the commit that merges the shards'
parts into the output once (``commit``).

``storage``, ``input`` and ``output`` sit below the checkpoint; ``commit`` reads the checkpoint's
parts, so it is the one module of this room that imports ``jobs.checkpoint``.
"""
