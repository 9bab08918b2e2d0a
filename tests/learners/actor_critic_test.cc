// The hand-written forward/backward of the PPO networks against finite
// differences of the loss, and the layout the header documents.
#include "learners/actor_critic.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "envs/rng.h"

using agentrt::ActorCritic;
using agentrt::PpoLossCoefs;
using agentrt::RowMatrix;

namespace {

struct Batch {
  RowMatrix obs;
  std::vector<float> actions, old_logp, adv, returns;
};

// Initialised parameters, then nudged: larger output weights than the init, so
// every loss term has a visible gradient.
std::vector<float> PerturbedParams(ActorCritic& net, agentrt::Rng& rng) {
  std::vector<float> params(net.num_params());
  net.Init(params.data(), rng);
  for (auto& x : params) x += 0.3f * static_cast<float>(rng.Normal());
  return params;
}

// A batch whose probability ratios sit well inside or well outside the clip
// range, so a small parameter nudge never crosses a kink of the clipped loss.
Batch MakeBatch(ActorCritic& net, const std::vector<float>& params, int batch, agentrt::Rng& rng) {
  Batch b;
  b.obs.resize(batch, net.obs_size());
  for (int i = 0; i < batch; ++i) {
    for (int j = 0; j < net.obs_size(); ++j) b.obs(i, j) = static_cast<float>(rng.Normal());
  }
  net.Forward(params.data(), b.obs);
  std::vector<float> logp(static_cast<size_t>(net.num_actions()));
  for (int i = 0; i < batch; ++i) {
    const int a = static_cast<int>(rng.Below(static_cast<uint64_t>(net.num_actions())));
    agentrt::LogSoftmax(net.logits().row(i).data(), net.num_actions(), logp.data());
    const float shift = std::array<float, 4>{0.0f, 0.05f, 0.7f, -0.7f}[static_cast<size_t>(i % 4)];
    b.actions.push_back(static_cast<float>(a));
    b.old_logp.push_back(logp[static_cast<size_t>(a)] + shift);
    b.adv.push_back(static_cast<float>(rng.Normal()));
    b.returns.push_back(static_cast<float>(rng.Normal()));
  }
  return b;
}

float Loss(ActorCritic& net, const std::vector<float>& params, const Batch& b,
           const PpoLossCoefs& coefs) {
  std::vector<float> scratch(net.num_params(), 0.0f);
  net.Forward(params.data(), b.obs);
  return net
      .LossAndGradient(params.data(), scratch.data(), b.actions, b.old_logp, b.adv, b.returns,
                       coefs)
      .loss;
}

}  // namespace

TEST_CASE("actor-critic parameter layout is policy then value, W then b per layer") {
  ActorCritic net(4, 2, 64, 2);
  const auto& p = net.policy().layers();
  const auto& v = net.value().layers();
  REQUIRE(p.size() == 3);
  REQUIRE(v.size() == 3);
  CHECK(p[0].w_offset == 0);
  CHECK(p[0].b_offset == 4 * 64);
  CHECK(p[1].w_offset == 4 * 64 + 64);
  CHECK(p[2].out == 2);
  CHECK(v[0].w_offset == net.policy().num_params());
  CHECK(v[2].out == 1);
  CHECK(net.num_params() ==
        (4 * 64 + 64 + 64 * 64 + 64 + 64 * 2 + 2) + (4 * 64 + 64 + 64 * 64 + 64 + 64 * 1 + 1));
}

TEST_CASE("actor-critic init is orthogonal with the documented gains and zero biases") {
  ActorCritic net(4, 2, 16, 2);
  std::vector<float> params(net.num_params());
  agentrt::Rng rng(1);
  net.Init(params.data(), rng);
  const auto& l1 = net.policy().layers()[1];  // 16 x 16 hidden: W W^T = 2 I
  Eigen::Map<const RowMatrix> w(params.data() + l1.w_offset, 16, 16);
  const RowMatrix wwt = w * w.transpose();
  CHECK((wwt - 2.0f * RowMatrix::Identity(16, 16)).cwiseAbs().maxCoeff() < 1e-4f);
  const auto& out = net.policy().layers()[2];  // 2 x 16, rows orthogonal with norm 0.01
  Eigen::Map<const RowMatrix> wo(params.data() + out.w_offset, 2, 16);
  CHECK(wo.row(0).norm() == Approx(0.01f).epsilon(1e-3));
  for (int k = 0; k < l1.out; ++k) CHECK(params[l1.b_offset + static_cast<size_t>(k)] == 0.0f);
}

TEST_CASE("actor-critic gradient matches finite differences of the PPO loss") {
  ActorCritic net(5, 3, 8, 2);
  agentrt::Rng rng(7);
  const std::vector<float> params = PerturbedParams(net, rng);
  const Batch b = MakeBatch(net, params, 12, rng);
  const PpoLossCoefs coefs{.clip_coef = 0.2f, .ent_coef = 0.05f, .vf_coef = 0.5f};

  std::vector<float> grads(net.num_params(), 0.0f);
  net.Forward(params.data(), b.obs);
  const agentrt::PpoLossTerms terms = net.LossAndGradient(params.data(), grads.data(), b.actions,
                                                          b.old_logp, b.adv, b.returns, coefs);
  CHECK(terms.clip_fraction > 0.0f);  // the clipped branch is exercised
  CHECK(terms.clip_fraction < 1.0f);

  const float eps = 3e-3f;
  int checked = 0;
  double worst = 0.0;
  for (size_t k = 0; k < params.size(); ++k) {
    std::vector<float> plus = params, minus = params;
    plus[k] += eps;
    minus[k] -= eps;
    const double numeric =
        (static_cast<double>(Loss(net, plus, b, coefs)) - Loss(net, minus, b, coefs)) / (2.0 * eps);
    const double analytic = grads[k];
    const double err =
        std::abs(numeric - analytic) / std::max(1e-2, std::abs(numeric) + std::abs(analytic));
    worst = std::max(worst, err);
    INFO("param " << k << " numeric " << numeric << " analytic " << analytic);
    REQUIRE(err < 2e-2);
    ++checked;
  }
  CHECK(checked == static_cast<int>(net.num_params()));
  WARN("worst relative gradient error " << worst);
}

TEST_CASE("actor-critic gradient of each loss term alone matches finite differences") {
  ActorCritic net(3, 2, 6, 1);
  agentrt::Rng rng(11);
  const std::vector<float> params = PerturbedParams(net, rng);
  const Batch b = MakeBatch(net, params, 8, rng);
  for (const PpoLossCoefs coefs : {PpoLossCoefs{0.2f, 1.0f, 0.0f}, PpoLossCoefs{0.2f, 0.0f, 1.0f},
                                   PpoLossCoefs{10.0f, 0.0f, 0.0f}}) {
    std::vector<float> grads(net.num_params(), 0.0f);
    net.Forward(params.data(), b.obs);
    (void)net.LossAndGradient(params.data(), grads.data(), b.actions, b.old_logp, b.adv, b.returns,
                              coefs);
    for (size_t k = 0; k < params.size(); ++k) {
      std::vector<float> plus = params, minus = params;
      plus[k] += 3e-3f;
      minus[k] -= 3e-3f;
      const double numeric =
          (static_cast<double>(Loss(net, plus, b, coefs)) - Loss(net, minus, b, coefs)) / 6e-3;
      INFO("ent " << coefs.ent_coef << " vf " << coefs.vf_coef << " param " << k);
      REQUIRE(grads[k] == Approx(numeric).margin(2e-3).epsilon(2e-2));
    }
  }
}
