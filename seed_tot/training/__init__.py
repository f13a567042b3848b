"""Training of the engine's learned parts (SpecDec++'s acceptance head), fed by data the engine generates."""
