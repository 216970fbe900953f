"""A stand-in for scikit-learn, as much as the programs here use: model_selection.KFold."""
