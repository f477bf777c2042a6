// PLACEHOLDER: the tests of this op group are written on their own branch.
