#include "lab/claims.h"

#include <fmt/format.h>

#include "sdpa/sdpa.h"

namespace sdpa::lab {
namespace {

const ClaimText kClaimTexts[kClaims] = {
    {"C1", "Softmax is very sensitive to the magnitude of its input",
     "Softmax 对输入的绝对大小极其敏感",
     "Softmax 并不是一个完美的函数，它对输入的绝对大小极其敏感。输入过大：Softmax "
     "的输出概率分布会变得极度尖锐（即某个值无限逼近 1，其他值逼近 0）。输入过小："
     "输出分布会趋于均匀（大家都是平庸的概率），注意力机制就失去了“区分度”和重点。",
     "Softmax 对输入的绝对大小极其敏感。输入过大：输出概率分布会变得极度尖锐（即某个值无限逼近 "
     "1，其他值逼近 0）；输入过小：输出分布会趋于均匀，注意力机制就失去了“区分度”和重点。",
     "Softmax is very sensitive to the absolute size of its input: too large, and the output "
     "becomes extremely sharp (one value near 1, the others near 0); too small, and it becomes "
     "uniform and attention loses its power to discriminate."},
    {"C2", "softmax([1000, 10, 5]) ≈ [1, 0, 0], and almost no gradient reaches the others",
     "softmax([1000, 10, 5]) ≈ [1, 0, 0]，梯度几乎无法传播到非最大值",
     "假设我们在未经缩放时，计算出的注意力分数差异稍微大一点，比如 [1000, 10, 5]。经过 Softmax "
     "后，输出会变成：Softmax([1000, 10, 5]) ≈ [1, 0, 0]。此时，梯度几乎无法传播到非最大值的位置。",
     "Softmax([1000, 10, 5]) ≈ [1, 0, 0]。此时，梯度几乎无法传播到非最大值的位置。",
     "softmax([1000, 10, 5]) ~ [1, 0, 0]; then the gradient can hardly propagate to the "
     "non-maximal positions."},
    {"C3", "E[q·k] = 0", "点积的期望为 0",
     "假设输入向量 Q 和 K 的维度为 d，并且它们的每个元素都是独立随机抽取的，服从均值为 0、方差为 1 "
     "的分布。当 Q 和 K 进行点积后：结果的期望值依然为 0。",
     "假设 Q 和 K 的每个元素都是独立随机抽取的，服从均值为 0、方差为 1 "
     "的分布：点积结果的期望值依然为 0。",
     "If the components of q and k are independent with mean 0 and variance 1, the expectation "
     "of their dot product is still 0."},
    {"C4", "Var(q·k) = d", "点积的方差为 d",
     "但结果的方差变成了 d。……平方项：……每一项都是 1×1 = 1，求和后为 "
     "d。交叉项：……所有交叉项的期望均为 "
     "0。因此，方差为 Var(Q·K) = d + 0 − 0 = d。",
     "但结果的方差变成了 d：平方项每一项都是 1 × 1 = 1，求和后为 d；交叉项的期望均为 0。",
     "... but the variance of the dot product becomes d: each of the d square terms "
     "contributes 1, and the cross terms have expectation 0."},
    {"C5", "With d = 512 the variance is 512", "d = 512 时方差为 512",
     "这意味着，如果你的词向量维度 d = 512，那么点积结果的方差直接飙升到了 512！",
     "如果你的词向量维度 d = 512，那么点积结果的方差直接飙升到了 512！",
     "With vectors of dimension d = 512, the variance of the dot product soars to 512."},
    {"C6", "Multiplying by 1/√d brings the variance back to 1", "乘以 1/√d 使方差回到 1",
     "因为点积后的方差变成了 d，为了让方差重新回到 "
     "1（保持数据的稳定分布），我们根据统计学中方差的性质 "
     "Var(cX) = c² Var(X)，需要给原本的变量乘以 1/√d。",
     "根据方差的性质 Var(cX) = c² Var(X)，需要给原本的变量乘以 1/√d，将点积结果的方差强行拉回 "
     "1。",
     "Since Var(cX) = c^2 Var(X), multiplying by 1/sqrt(d) pulls the variance of the dot "
     "product back to 1."},
    {"C7", "Unscaled scores saturate softmax and the gradient vanishes",
     "不缩放，softmax 陷入饱和、梯度消失",
     "如果不进行缩放，数值过大会导致 Softmax 陷入饱和区，引发梯度消失。除以 √d "
     "是为了将点积结果的方差强行拉回 1，保证 Softmax "
     "输入处于合理区间，从而保障反向传播时梯度的稳定。",
     "如果不进行缩放，数值过大会导致 Softmax 陷入饱和区，引发梯度消失。除以 √d 是为了保证 "
     "Softmax 输入处于合理区间，从而保障反向传播时梯度的稳定。",
     "Without scaling, values that are too large push softmax into its saturated region and "
     "the gradient vanishes; dividing by sqrt(d) keeps the softmax input in a reasonable range "
     "and the gradient stable in back-propagation."},
    {"C8", "Without the scaling the network is stuck and can hardly learn",
     "不缩放，网络“卡死”、几乎无法学习",
     "这会导致一个致命问题——梯度消失，在反向传播时梯度趋近于 "
     "0，模型几乎无法学习。……整个网络在这个节点上就“卡死”了。",
     "梯度消失，在反向传播时梯度趋近于 0，模型几乎无法学习；整个网络在这个节点上就“卡死”了。",
     "Without the scaling, the network is 'stuck' at that point and can hardly learn."},
};

}  // namespace

const ClaimText* claim_texts() { return kClaimTexts; }

const ClaimText& find_claim(const std::string& id) {
  for (const auto& c : kClaimTexts) {
    if (id == c.id) return c;
  }
  throw Error(fmt::format("lab claim: expected an id C1..C8, got '{}'", id));
}

std::string claim_text(const std::string& id, Lang lang) {
  const ClaimText& c = find_claim(id);
  return lang == Lang::zh ? c.claim_zh : c.claim_en;
}

}  // namespace sdpa::lab
