"""HTTP servers over the library: the reward server's app (``rewards``)."""
