// The random energy model (REM) on both sides of its freezing point, and the closed forms the
// saturation and temperature experiments compare their measurements with.
//
// Softmax over N independent N(0, s^2) logits is the Boltzmann distribution of Derrida's REM at
// inverse temperature s. With Z = sum_j exp(s g_j):
//   - liquid (annealed) side: E Z = N e^{s^2/2} and the entropy is ln N - s^2/2, valid while Z
//     concentrates, that is while Var Z / (E Z)^2 = (e^{s^2} - 1)/N is small: it passes 1 at
//     s^2 = ln(N + 1), half-way to the freezing point in s^2;
//   - the freezing point s_c = sqrt(2 ln N), where the annealed entropy reaches 0;
//   - frozen side (s > s_c): the weights of the largest terms tend to a Poisson-Dirichlet
//     PD(m, 0) law with m = s_c / s, whose expected entropy is psi(1) - psi(1 - m) (psi the
//     digamma function): order 1, falling to 0 as s grows, never negative.
#pragma once

#include <string>

namespace sdpa::lab {

/// The digamma function psi(x) for x > 0 (recurrence to x >= 6, then the asymptotic series;
/// absolute error below 1e-12).
double digamma(double x);

/// ln N - s^2/2: the annealed (liquid-side) entropy.
double rem_annealed_entropy(double s, double n);
/// sqrt(2 ln N): the freezing point.
double rem_freezing_s(double n);
/// (e^{s^2} - 1)/N: the relative variance of the partition function.
double rem_z_relative_variance(double s, double n);
/// sqrt(ln(N + 1)): where that relative variance reaches 1 (the finite-N crossover).
double rem_crossover_s(double n);
/// psi(1) - psi(1 - m), m = s_c/s: the frozen-side entropy (only for s > s_c).
double rem_frozen_entropy(double s, double n);
/// Past s_c the Poisson-Dirichlet law is compared from kRemDeepFrozen * s_c on: just past s_c
/// its entropy diverges (m -> 1), where the finite-N entropy stays near the crossover's.
inline constexpr double kRemDeepFrozen = 1.5;
/// The theory the lab quotes at (s, N): annealed below s_c (it falls to 0 there),
/// Poisson-Dirichlet from kRemDeepFrozen * s_c on, and NaN (no value: the lab writes null) in
/// between, where neither law applies: the annealed line has left 0 behind and PD diverges at
/// s_c. So it stays within [0, ln N] and never rises with s. PD is the N -> inf law: at finite
/// N it overestimates deep in the frozen phase (1.55 against 1.02 measured at N = 8192, s = 8),
/// since the top logits' spacing converges to its limit only as 1/sqrt(ln N).
double rem_entropy(double s, double n);
/// "liquid" while (e^{s^2} - 1)/N < 1, "crossover" from there to s_c, "frozen" past s_c.
std::string rem_regime(double s, double n);

/// The norm of a gradient row under uniform attention at the scale 1/sqrt(d), with Q, K, V and
/// dO of independent standard-normal entries: dS_j = (dP_j - mean dP)/N with dP_j ~ N(0, d)
/// gives E|dS|^2 = d (N - 1)/N^2, and dQ = K^T dS / sqrt(d) has the same expected square norm;
/// a key row's dK_j = sum_i dS_ij q_i / sqrt(d) over `queries` rows has queries d (N - 1)/N^3.
/// The lab's "dead" threshold is kDeadFactor times these: fixed by (d, N), not by a
/// measurement.
double uniform_grad_logits(int d, int n);
double uniform_grad_q(int d, int n);
double uniform_grad_k(int d, int n, int queries);

/// The expected largest of N standard normals to second order, sqrt(2 ln N) minus
/// (ln ln N + ln 4 pi) / (2 sqrt(2 ln N)); its inverse sets the spacing of the top two (N >= 3).
double gaussian_max_location(double n);

/// The top-two-gap prediction of the fraction of dead dQ rows with logits of standard deviation
/// s (scale `scale_value` at dimension d) over N keys. In a frozen row the top two logits are
/// about s E / a_N apart (E ~ Exp(1), a_N = gaussian_max_location), the second key carries
/// p2 ~ e^{-gap}, and |dQ| ~ p2 G with G = scale 2 d sqrt(2/pi) (|dP_2 - dP_1| |k_2 - k_1| for
/// Gaussian rows). The row is dead once p2 G < threshold, i.e. gap > t* = ln(G / threshold), so
///   dead ~ P(E > t* a_N / s) = exp(-t* a_N / s).
/// A frozen-phase approximation: in the liquid phase it is ~0, as is the measurement.
double predicted_dead_fraction(double scale_value, int d, int n, double threshold);

}  // namespace sdpa::lab
