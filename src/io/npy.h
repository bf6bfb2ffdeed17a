// Writing .npy files through an OutputCommit (io/output.h), for commands that write several
// outputs all-or-nothing and name each by its flag in messages.
#pragma once

#include <cstddef>

#include "io/output.h"
#include "sdpa/sdpa.h"

namespace sdpa::io {

/// Writes `tensor` as a .npy file into the temporary of file output `index` of `commit`.
void write_npy(OutputCommit& commit, std::size_t index, const TensorRef& tensor);

}  // namespace sdpa::io
