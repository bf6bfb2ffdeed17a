// Temporary: until the fused kernel lands, the fast and naive entry points use the reference.
#include "kernels/kernels.h"
#include "reference/reference.h"

namespace sdpa::detail {

void fast_forward(const Problem& p, void* out, void* lse) { reference_forward(p, out, lse); }
void fast_backward(const Problem& p, const void*, const void*, const void* grad_out, void* dq,
                   void* dk, void* dv) {
  reference_backward(p, grad_out, dq, dk, dv);
}
void naive_forward(const Problem& p, void* out, void* lse) { reference_forward(p, out, lse); }
void naive_backward(const Problem& p, const void*, const void*, const void* grad_out, void* dq,
                    void* dk, void* dv) {
  reference_backward(p, grad_out, dq, dk, dv);
}

}  // namespace sdpa::detail
