"""The SimPy simulator of a serving deployment (`simulator`), its entities (`entities`) and the metrics it
reports (`metrics`)."""
