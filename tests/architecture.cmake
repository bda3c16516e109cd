# The shape of the code itself (docs/architecture.md): the product folders' include graph against
# the one the document draws. Python standard library only; no build product needed.
add_test(NAME include_graph_test
  COMMAND ${DDPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/unit/include_graph_test.py)
set_tests_properties(include_graph_test PROPERTIES TIMEOUT 60 LABELS unit SKIP_RETURN_CODE 77)

# The size limits (issue 46): no product file over 800 lines, no function over 150 (100 in
# launcher/agent/) but the flag tables. Needs ctags (universal-ctags) for C++; skips without.
add_test(NAME code_shape_test
  COMMAND ${DDPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/unit/code_shape_test.py)
set_tests_properties(code_shape_test PROPERTIES TIMEOUT 60 LABELS unit SKIP_RETURN_CODE 77)

# One naming style for data members (snake_case, members_ with a trailing _): a camelCase field
# declared in a product folder fails, naming its file and line.
add_test(NAME field_naming_test
  COMMAND ${DDPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/unit/field_naming_test.py)
set_tests_properties(field_naming_test PROPERTIES TIMEOUT 60 LABELS unit SKIP_RETURN_CODE 77)
