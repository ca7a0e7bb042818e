//! Table tests: placeholder
