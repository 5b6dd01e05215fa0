// On a narrow screen, a tap on a figure toggles between fitting the column and a readable width (posenc.css).
document.addEventListener("click", function (event) {
  var img = event.target.closest ? event.target.closest("img.posenc-img") : null;
  if (!img || window.innerWidth > 600) return;
  var figure = img.closest("figure");
  if (figure) figure.classList.toggle("posenc-zoomed");
});
